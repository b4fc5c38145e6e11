//! Control frames: the JSON text messages `request`, `response`, `end`, `abort`.

use super::head_limits::HeadLimits;
use super::headers::is_token;
use super::raw::{LHeaders, LNum, LStr, RawFrame, Wanted};
use super::{FrameError, Headers, IdError, Message, StreamId, MAX_MESSAGE_LEN};
use std::borrow::Cow;

/// The head of an HTTP request as the relay forwards it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// A method of RFC 9110 as a static string: no allocation.
    method: Cow<'static, str>,
    path: String,
    query: String,
    headers: Headers,
}

fn visible_ascii(s: &str) -> bool {
    s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

impl RequestHead {
    /// A validated request head: `method` is an HTTP token, `path` starts with
    /// `/`, and `path` and `query` hold only visible ASCII (as on the wire,
    /// percent-encoded). `query` excludes the `?`.
    pub fn new(
        method: impl Into<String>,
        path: impl Into<String>,
        query: impl Into<String>,
        headers: Headers,
    ) -> Result<RequestHead, FrameError> {
        let (method, path, query) = (method.into(), path.into(), query.into());
        RequestHead::checked(method_text(method), path, query, headers)
    }

    /// [`RequestHead::new`] from borrowed text: a copy of `path` and of a
    /// non-empty `query`, none of a method RFC 9110 defines.
    pub(crate) fn from_strs(
        method: &str,
        path: &str,
        query: &str,
        headers: Headers,
    ) -> Result<RequestHead, FrameError> {
        let method = match known_method(method) {
            Some(m) => Cow::Borrowed(m),
            None => Cow::Owned(method.to_owned()),
        };
        RequestHead::checked(method, path.to_owned(), query.to_owned(), headers)
    }

    fn checked(
        method: Cow<'static, str>,
        path: String,
        query: String,
        headers: Headers,
    ) -> Result<RequestHead, FrameError> {
        if !is_token(&method) {
            return Err(FrameError::InvalidMethod);
        }
        if !path.starts_with('/') || !visible_ascii(&path) {
            return Err(FrameError::InvalidPath);
        }
        if !visible_ascii(&query) {
            return Err(FrameError::InvalidQuery);
        }
        Ok(RequestHead {
            method,
            path,
            query,
            headers,
        })
    }

    /// The HTTP method.
    pub fn method(&self) -> &str {
        &self.method
    }
    /// The path, starting with `/`, percent-encoded as on the wire.
    pub fn path(&self) -> &str {
        &self.path
    }
    /// The raw query string without the `?`, or `""`.
    pub fn query(&self) -> &str {
        &self.query
    }
    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }
    /// The headers, mutably (the list keeps its validation invariant).
    pub fn headers_mut(&mut self) -> &mut Headers {
        &mut self.headers
    }
    /// The path and query as a request target (`/p?q`).
    pub fn target(&self) -> String {
        if self.query.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{}", self.path, self.query)
        }
    }
}

/// The methods RFC 9110 defines, and PATCH (RFC 5789).
const KNOWN_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE",
];

fn known_method(method: &str) -> Option<&'static str> {
    KNOWN_METHODS.iter().copied().find(|m| *m == method)
}

/// `method`, as a static string if it is a known one.
fn method_text(method: String) -> Cow<'static, str> {
    match known_method(&method) {
        Some(m) => Cow::Borrowed(m),
        None => Cow::Owned(method),
    }
}

/// The head of an HTTP response as the worker sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    status: u16,
    headers: Headers,
}

impl ResponseHead {
    /// A validated response head: `status` is in 100..=999.
    pub fn new(status: u16, headers: Headers) -> Result<ResponseHead, FrameError> {
        if !(100..=999).contains(&status) {
            return Err(FrameError::InvalidStatus);
        }
        Ok(ResponseHead { status, headers })
    }
    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }
    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }
    /// The headers, mutably.
    pub fn headers_mut(&mut self) -> &mut Headers {
        &mut self.headers
    }
}

/// A control frame: one JSON text message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlFrame {
    /// Relay to worker: opens a stream for an HTTP request.
    Request {
        /// The stream.
        id: StreamId,
        /// The request head.
        head: RequestHead,
    },
    /// Worker to relay: starts the answer.
    Response {
        /// The stream.
        id: StreamId,
        /// The response head.
        head: ResponseHead,
    },
    /// Either way: the body of this direction is complete.
    End {
        /// The stream.
        id: StreamId,
    },
    /// Either way: the sender gives up on the stream.
    Abort {
        /// The stream.
        id: StreamId,
    },
}

/// The frame as `serde` sees it: the oracle the hand-written encoder
/// (`json_out`) is tested against.
#[cfg(test)]
#[derive(serde::Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Wire<'a> {
    Request {
        id: StreamId,
        method: &'a str,
        path: &'a str,
        query: &'a str,
        headers: &'a Headers,
    },
    Response {
        id: StreamId,
        status: u16,
        headers: &'a Headers,
    },
    End {
        id: StreamId,
    },
    Abort {
        id: StreamId,
    },
}

impl ControlFrame {
    /// The stream this frame belongs to.
    pub fn id(&self) -> StreamId {
        match self {
            ControlFrame::Request { id, .. }
            | ControlFrame::Response { id, .. }
            | ControlFrame::End { id }
            | ControlFrame::Abort { id } => *id,
        }
    }

    /// The frame's `type` field.
    pub fn type_name(&self) -> &'static str {
        match self {
            ControlFrame::Request { .. } => "request",
            ControlFrame::Response { .. } => "response",
            ControlFrame::End { .. } => "end",
            ControlFrame::Abort { .. } => "abort",
        }
    }

    /// Encodes the frame as compact JSON with the spec's field order
    /// (`type`, `id`, then the rest).
    pub fn encode(&self) -> String {
        super::json_out::encode(self)
    }

    #[cfg(test)]
    pub(super) fn encode_with_serde(&self) -> String {
        let wire = match self {
            ControlFrame::Request { id, head } => Wire::Request {
                id: *id,
                method: &head.method,
                path: &head.path,
                query: &head.query,
                headers: &head.headers,
            },
            ControlFrame::Response { id, head } => Wire::Response {
                id: *id,
                status: head.status,
                headers: &head.headers,
            },
            ControlFrame::End { id } => Wire::End { id: *id },
            ControlFrame::Abort { id } => Wire::Abort { id: *id },
        };
        serde_json::to_string(&wire).expect("control frames always serialize")
    }

    /// Encodes the frame, refusing it ([`FrameError::TooLarge`]) if it is
    /// over the 1 MiB + 4 bytes a message may hold (a head with huge headers).
    pub fn encode_checked(&self) -> Result<String, FrameError> {
        let text = self.encode();
        if text.len() > MAX_MESSAGE_LEN {
            return Err(FrameError::TooLarge {
                len: text.len(),
                limit: MAX_MESSAGE_LEN,
            });
        }
        Ok(text)
    }

    /// Encodes the frame as a text [`Message`].
    pub fn to_message(&self) -> Message {
        Message::Text(self.encode())
    }

    /// Decodes a text message. See [`decode_text`](super::decode_text) for the
    /// outcome of an unknown `type`.
    pub fn decode(text: &str) -> Result<Option<ControlFrame>, FrameError> {
        decode_control(text)
    }
}

fn req_str<'a>(f: Option<LStr<'a>>, name: &'static str) -> Result<Cow<'a, str>, FrameError> {
    match f {
        None => Err(FrameError::MissingField(name)),
        Some(LStr::Wrong) => Err(FrameError::WrongType(name)),
        Some(LStr::Str(s)) => Ok(s),
    }
}

fn opt_str<'a>(f: Option<LStr<'a>>, name: &'static str) -> Result<Cow<'a, str>, FrameError> {
    match f {
        None => Ok(Cow::Borrowed("")),
        other => req_str(other, name),
    }
}

fn parse_id(f: Option<LNum>) -> Result<StreamId, IdError> {
    let v = match f {
        None => return Err(IdError::Missing),
        Some(LNum::Wrong) => return Err(IdError::NotANumber),
        Some(LNum::I(i)) if i < 0 => return Err(IdError::Negative),
        Some(LNum::I(i)) => i as u64,
        Some(LNum::U(u)) => u,
        // serde_json reads the integer literal `-0` as the float -0.0: it is 0.
        Some(LNum::F(x)) if x == 0.0 && x.is_sign_negative() => return Err(IdError::Zero),
        Some(LNum::F(x)) if x < 0.0 => return Err(IdError::Negative),
        Some(LNum::F(x)) if x.is_finite() && x.fract() == 0.0 && x > u32::MAX as f64 => {
            return Err(IdError::TooLarge)
        }
        Some(LNum::F(_)) => return Err(IdError::Fractional),
    };
    let v = u32::try_from(v).map_err(|_| IdError::TooLarge)?;
    StreamId::new(v).ok_or(IdError::Zero)
}

fn parse_status(f: Option<LNum>) -> Result<u16, FrameError> {
    match f {
        None => Err(FrameError::MissingField("status")),
        Some(LNum::U(u)) if (100..=999).contains(&u) => Ok(u as u16),
        Some(_) => Err(FrameError::InvalidStatus),
    }
}

fn parse_headers(f: Option<LHeaders>) -> Result<Headers, FrameError> {
    match f {
        None => Ok(Headers::new()),
        Some(LHeaders::Wrong) => Err(FrameError::WrongType("headers")),
        Some(LHeaders::OverLimit(e)) => Err(FrameError::HeadOverLimit(e)),
        Some(LHeaders::Invalid(e)) => Err(e.into()),
        Some(LHeaders::Ok(h)) => Ok(h),
    }
}

/// A control frame that was refused, with its type and id when those were
/// readable (so a machine can answer the stream it names).
#[derive(Debug)]
pub(crate) struct Refused {
    pub error: FrameError,
    /// The frame's `type` (`"request"`, …) and valid id, if both were read.
    pub known: Option<(&'static str, StreamId)>,
}

impl From<FrameError> for Refused {
    fn from(error: FrameError) -> Refused {
        Refused { error, known: None }
    }
}

/// Decodes a control frame; `Ok(None)` for a frame of unknown `type`.
pub(crate) fn decode_control(text: &str) -> Result<Option<ControlFrame>, FrameError> {
    decode_control_limited(text, None, None).map_err(|r| r.error)
}

/// [`decode_control`] with heads held to `limits`: a `request` or `response`
/// over a bound is [`FrameError::HeadOverLimit`], and a header list that
/// crosses a bound is skipped unread from that point on. A frame whose
/// `type` and id `wanted` declines is `Ok(None)`, like an unknown type,
/// read no further than its id.
pub(crate) fn decode_control_limited(
    text: &str,
    limits: Option<&HeadLimits>,
    wanted: Option<Wanted<'_>>,
) -> Result<Option<ControlFrame>, Refused> {
    decode_control_with(text, limits, wanted, true)
}

/// [`decode_control_limited`], with the fast scanner (`fast`) or by the
/// `serde` reference path alone.
pub(crate) fn decode_control_with(
    text: &str,
    limits: Option<&HeadLimits>,
    wanted: Option<Wanted<'_>>,
    fast: bool,
) -> Result<Option<ControlFrame>, Refused> {
    if text.len() > MAX_MESSAGE_LEN {
        return Err(FrameError::TooLarge {
            len: text.len(),
            limit: MAX_MESSAGE_LEN,
        }
        .into());
    }
    let first = text
        .bytes()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first != Some(b'{') {
        // Either not JSON at all or JSON of another kind: tell the two apart.
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => FrameError::NotAnObject,
            Err(e) => FrameError::InvalidJson(e.to_string()),
        }
        .into());
    }
    let scanned = if fast {
        super::fast::scan(text, limits)
    } else {
        None
    };
    let raw = match scanned {
        // The plain frames peers send: scanned without serde, the same answer.
        Some(raw) => {
            if let (Some(wanted), Some(LStr::Str(ty)), Some(LNum::U(id))) =
                (wanted, &raw.ty, &raw.id)
            {
                if !wanted(ty, *id) {
                    return Ok(None);
                }
            }
            raw
        }
        None => match RawFrame::parse(text, limits, wanted)
            .map_err(|e| FrameError::InvalidJson(e.to_string()))?
        {
            Some(raw) => raw,
            None => return Ok(None),
        },
    };
    let ty = req_str(raw.ty, "type")?;
    let frame = match &*ty {
        "request" => {
            let id = parse_id(raw.id).map_err(FrameError::from)?;
            let known = |error| Refused {
                error,
                known: Some(("request", id)),
            };
            let head = (|| {
                let method = req_str(raw.method, "method")?;
                let path = req_str(raw.path, "path")?;
                let query = opt_str(raw.query, "query")?;
                let headers = parse_headers(raw.headers)?;
                let head = RequestHead::from_strs(&method, &path, &query, headers)?;
                if let Some(l) = limits {
                    l.check_request(&head)?;
                }
                Ok(head)
            })()
            .map_err(known)?;
            ControlFrame::Request { id, head }
        }
        "response" => {
            let id = parse_id(raw.id).map_err(FrameError::from)?;
            let known = |error| Refused {
                error,
                known: Some(("response", id)),
            };
            let head = (|| {
                let status = parse_status(raw.status)?;
                let headers = parse_headers(raw.headers)?;
                let head = ResponseHead::new(status, headers)?;
                if let Some(l) = limits {
                    l.check_response(&head)?;
                }
                Ok(head)
            })()
            .map_err(known)?;
            ControlFrame::Response { id, head }
        }
        "end" => ControlFrame::End {
            id: parse_id(raw.id).map_err(FrameError::from)?,
        },
        "abort" => ControlFrame::Abort {
            id: parse_id(raw.id).map_err(FrameError::from)?,
        },
        _ => return Ok(None),
    };
    Ok(Some(frame))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> StreamId {
        StreamId::new(n).unwrap()
    }

    fn err(text: &str) -> FrameError {
        decode_control(text).unwrap_err()
    }

    #[test]
    fn encodes_in_spec_field_order() {
        let headers = Headers::try_from_pairs([("content-type", "application/x-tar")]).unwrap();
        let resp = ControlFrame::Response {
            id: id(7),
            head: ResponseHead::new(200, headers).unwrap(),
        };
        assert_eq!(
            resp.encode(),
            r#"{"type":"response","id":7,"status":200,"headers":[["content-type","application/x-tar"]]}"#
        );
        let req = ControlFrame::Request {
            id: id(1),
            head: RequestHead::new("GET", "/health", "", Headers::new()).unwrap(),
        };
        assert_eq!(
            req.encode(),
            r#"{"type":"request","id":1,"method":"GET","path":"/health","query":"","headers":[]}"#
        );
        assert_eq!(
            ControlFrame::End { id: id(7) }.encode(),
            r#"{"type":"end","id":7}"#
        );
        assert_eq!(
            ControlFrame::Abort { id: id(7) }.encode(),
            r#"{"type":"abort","id":7}"#
        );
    }

    #[test]
    fn decodes_the_spec_example() {
        let text = r#"{
          "type": "request", "id": 7, "method": "POST", "path": "/v1/execute", "query": "",
          "headers": [["authorization", "Bearer t"], ["content-type", "multipart/form-data; boundary=x"], ["content-length", "52133"]]
        }"#;
        let Some(ControlFrame::Request { id: i, head }) = decode_control(text).unwrap() else {
            panic!("not a request")
        };
        assert_eq!(i.get(), 7);
        assert_eq!(head.method(), "POST");
        assert_eq!(head.path(), "/v1/execute");
        assert_eq!(head.headers().content_length(), Ok(Some(52133)));
    }

    #[test]
    fn tolerates_unknown_fields_and_ignores_unknown_types() {
        let f = decode_control(r#"{"type":"end","id":3,"extra":{"x":[1,2]},"more":null}"#).unwrap();
        assert_eq!(f, Some(ControlFrame::End { id: id(3) }));
        assert_eq!(
            decode_control(r#"{"type":"window_update","id":"x"}"#).unwrap(),
            None
        );
    }

    #[test]
    fn id_validation() {
        assert_eq!(err(r#"{"type":"end","id":0}"#), IdError::Zero.into());
        assert_eq!(err(r#"{"type":"end","id":-1}"#), IdError::Negative.into());
        assert_eq!(
            err(r#"{"type":"end","id":1.5}"#),
            IdError::Fractional.into()
        );
        assert_eq!(
            err(r#"{"type":"end","id":4294967296}"#),
            IdError::TooLarge.into()
        );
        assert_eq!(err(r#"{"type":"end","id":1e30}"#), IdError::TooLarge.into());
        assert_eq!(
            err(r#"{"type":"end","id":"7"}"#),
            IdError::NotANumber.into()
        );
        assert_eq!(
            err(r#"{"type":"end","id":true}"#),
            IdError::NotANumber.into()
        );
        assert_eq!(err(r#"{"type":"end"}"#), IdError::Missing.into());
        let max = decode_control(r#"{"type":"abort","id":4294967295}"#).unwrap();
        assert_eq!(max, Some(ControlFrame::Abort { id: StreamId::MAX }));
    }

    #[test]
    fn field_validation() {
        assert_eq!(
            err(r#"{"type":"request","id":1,"method":"G T","path":"/"}"#),
            FrameError::InvalidMethod
        );
        assert_eq!(
            err(r#"{"type":"request","id":1,"method":"GET","path":"x"}"#),
            FrameError::InvalidPath
        );
        assert_eq!(
            err(r#"{"type":"request","id":1,"method":"GET","path":"/a b"}"#),
            FrameError::InvalidPath
        );
        assert_eq!(
            err(r#"{"type":"request","id":1,"method":"GET","path":"/","query":"a\nb"}"#),
            FrameError::InvalidQuery
        );
        assert_eq!(
            err(r#"{"type":"request","id":1,"path":"/"}"#),
            FrameError::MissingField("method")
        );
        assert_eq!(
            err(r#"{"type":"request","id":1,"method":7,"path":"/"}"#),
            FrameError::WrongType("method")
        );
        assert_eq!(
            err(r#"{"type":"request","id":1,"method":"GET","path":"/","headers":{"a":"b"}}"#),
            FrameError::WrongType("headers")
        );
        assert_eq!(
            err(r#"{"type":"request","id":1,"method":"GET","path":"/","headers":[["a","b","c"]]}"#),
            FrameError::WrongType("headers")
        );
        assert_eq!(
            err(r#"{"type":"response","id":1,"status":99}"#),
            FrameError::InvalidStatus
        );
        assert_eq!(
            err(r#"{"type":"response","id":1,"status":1000}"#),
            FrameError::InvalidStatus
        );
        assert_eq!(
            err(r#"{"type":"response","id":1,"status":200.5}"#),
            FrameError::InvalidStatus
        );
        assert_eq!(
            err(r#"{"type":"response","id":1}"#),
            FrameError::MissingField("status")
        );
        assert_eq!(err(r#"{"id":1}"#), FrameError::MissingField("type"));
        assert_eq!(err(r#"{"type":5,"id":1}"#), FrameError::WrongType("type"));
    }

    #[test]
    fn header_injection_is_refused() {
        let e = err(
            r#"{"type":"response","id":1,"status":200,"headers":[["x","a\r\nSet-Cookie: evil"]]}"#,
        );
        assert_eq!(e.kind(), "header_forbidden_char");
        let e = err(r#"{"type":"response","id":1,"status":200,"headers":[["x","\u0100"]]}"#);
        assert_eq!(e.kind(), "header_not_latin1");
        let e = err(r#"{"type":"response","id":1,"status":200,"headers":[["a b","x"]]}"#);
        assert_eq!(e.kind(), "header_name");
    }

    #[test]
    fn not_json_or_not_an_object() {
        assert_eq!(err("[1,2]"), FrameError::NotAnObject);
        assert_eq!(err(" 7 "), FrameError::NotAnObject);
        assert_eq!(err("\"s\""), FrameError::NotAnObject);
        assert!(matches!(err("{"), FrameError::InvalidJson(_)));
        assert!(matches!(err(""), FrameError::InvalidJson(_)));
        assert!(matches!(err("{} trailing"), FrameError::InvalidJson(_)));
        assert!(matches!(err("nope"), FrameError::InvalidJson(_)));
    }

    #[test]
    fn oversize_text_is_too_large() {
        let text = format!(
            r#"{{"type":"end","id":1,"pad":"{}"}}"#,
            "x".repeat(MAX_MESSAGE_LEN)
        );
        assert_eq!(err(&text).close_code().0, 1009);
    }
}
