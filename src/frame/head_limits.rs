//! Bounds on the size of one HTTP head (`request` or `response` frame), in
//! the spirit of nginx and Envoy, and the checks against them.

use super::{RequestHead, ResponseHead};

/// Bounds on one HTTP head, applied by both state machines to every head
/// they receive (the relay also to every request it opens).
///
/// The defaults are those of the proxies a relay stands beside:
///
/// | bound | default | nginx / Envoy |
/// |---|---|---|
/// | `max_headers` | 100 | Envoy `max_headers_count` 100; hyper's parser 100 |
/// | `max_head_bytes` | 64 KiB | Envoy `max_request_headers_kb` 60 KiB; nginx 4 × 8 KiB |
/// | `max_target_len` | 8 KiB | nginx: a request line must fit an 8 KiB buffer (414) |
/// | `max_method_len` | 32 | the longest registered method is 17 bytes |
///
/// The size of a head is what HTTP/1.1 would write: the request or status
/// line, then `name: value\r\n` per header (names and values counted in the
/// bytes of their UTF-8 strings), then `\r\n`.
///
/// Fields are public; the struct may grow, so build it from
/// [`HeadLimits::default`] and set what you need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeadLimits {
    /// Headers in one head. Default 100.
    pub max_headers: usize,
    /// Bytes of one head. Default 64 KiB.
    pub max_head_bytes: usize,
    /// Bytes of a request's target (path, `?`, query). Default 8 KiB.
    pub max_target_len: usize,
    /// Bytes of a request's method. Default 32.
    pub max_method_len: usize,
}

impl Default for HeadLimits {
    fn default() -> HeadLimits {
        HeadLimits {
            max_headers: 100,
            max_head_bytes: 64 << 10,
            max_target_len: 8 << 10,
            max_method_len: 32,
        }
    }
}

/// Which bound a head exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeadLimitError {
    /// More headers than `max_headers`.
    #[error("more than {limit} headers")]
    TooManyHeaders {
        /// The bound.
        limit: usize,
    },
    /// The head is larger than `max_head_bytes`.
    #[error("head larger than {limit} bytes")]
    HeadTooLarge {
        /// The bound.
        limit: usize,
    },
    /// The request target is longer than `max_target_len`.
    #[error("request target of {len} bytes is longer than {limit}")]
    TargetTooLong {
        /// The target's length.
        len: usize,
        /// The bound.
        limit: usize,
    },
    /// The method is longer than `max_method_len`.
    #[error("method of {len} bytes is longer than {limit}")]
    MethodTooLong {
        /// The method's length.
        len: usize,
        /// The bound.
        limit: usize,
    },
}

impl HeadLimitError {
    /// The HTTP status a server answers a request over this bound with:
    /// 431 for too many or too large headers, 414 for a long target, 400 for
    /// a long method. (A response over a bound is a 502 at the relay.)
    pub fn status(&self) -> u16 {
        match self {
            HeadLimitError::TooManyHeaders { .. } | HeadLimitError::HeadTooLarge { .. } => 431,
            HeadLimitError::TargetTooLong { .. } => 414,
            HeadLimitError::MethodTooLong { .. } => 400,
        }
    }
}

/// `name: value\r\n`.
pub(crate) fn header_line_len(name: &str, value: &str) -> usize {
    name.len() + value.len() + 4
}

/// `HTTP/1.1 200 \r\n` (no reason phrase) plus the final `\r\n`.
const STATUS_LINE_LEN: usize = 17;

impl HeadLimits {
    /// Checks a request head: method, target, then headers.
    pub fn check_request(&self, head: &RequestHead) -> Result<(), HeadLimitError> {
        let method = head.method().len();
        if method > self.max_method_len {
            return Err(HeadLimitError::MethodTooLong {
                len: method,
                limit: self.max_method_len,
            });
        }
        let target = head.path().len()
            + if head.query().is_empty() {
                0
            } else {
                1 + head.query().len()
            };
        if target > self.max_target_len {
            return Err(HeadLimitError::TargetTooLong {
                len: target,
                limit: self.max_target_len,
            });
        }
        // `METHOD target HTTP/1.1\r\n` and the final `\r\n`.
        self.check_headers(method + target + 13, head.headers().iter())
    }

    /// Checks a response head's headers.
    pub fn check_response(&self, head: &ResponseHead) -> Result<(), HeadLimitError> {
        self.check_headers(STATUS_LINE_LEN, head.headers().iter())
    }

    fn check_headers<'a>(
        &self,
        mut bytes: usize,
        headers: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Result<(), HeadLimitError> {
        for (count, (n, v)) in headers.enumerate() {
            if count >= self.max_headers {
                return Err(HeadLimitError::TooManyHeaders {
                    limit: self.max_headers,
                });
            }
            bytes += header_line_len(n, v);
        }
        if bytes > self.max_head_bytes {
            return Err(HeadLimitError::HeadTooLarge {
                limit: self.max_head_bytes,
            });
        }
        Ok(())
    }

    /// A running count for the decoder: whether one more header still fits.
    pub(crate) fn header_fits(&self, count: usize, bytes: usize) -> Option<HeadLimitError> {
        if count > self.max_headers {
            Some(HeadLimitError::TooManyHeaders {
                limit: self.max_headers,
            })
        } else if bytes > self.max_head_bytes {
            Some(HeadLimitError::HeadTooLarge {
                limit: self.max_head_bytes,
            })
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Headers;

    fn headers(n: usize, value: &str) -> Headers {
        Headers::try_from_pairs((0..n).map(|i| (format!("x-{i}"), value.to_string()))).unwrap()
    }

    #[test]
    fn request_bounds_in_order_method_target_headers() {
        let l = HeadLimits::default();
        let ok = RequestHead::new("GET", "/health", "", headers(100, "v")).unwrap();
        assert_eq!(l.check_request(&ok), Ok(()));
        let many = RequestHead::new("GET", "/", "", headers(101, "v")).unwrap();
        let e = l.check_request(&many).unwrap_err();
        assert_eq!(e, HeadLimitError::TooManyHeaders { limit: 100 });
        assert_eq!(e.status(), 431);
        let big = RequestHead::new("GET", "/", "", headers(2, &"v".repeat(40 << 10))).unwrap();
        assert_eq!(l.check_request(&big).unwrap_err().status(), 431);
        let long = RequestHead::new("GET", "/".repeat(8 << 10), "q", headers(0, "")).unwrap();
        let e = l.check_request(&long).unwrap_err();
        assert_eq!(
            e,
            HeadLimitError::TargetTooLong {
                len: (8 << 10) + 2,
                limit: 8 << 10
            }
        );
        assert_eq!(e.status(), 414);
        let exact = RequestHead::new("GET", "/".repeat(8 << 10), "", headers(0, "")).unwrap();
        assert_eq!(l.check_request(&exact), Ok(()));
        let method = RequestHead::new("M".repeat(33), "/", "", headers(0, "")).unwrap();
        assert_eq!(l.check_request(&method).unwrap_err().status(), 400);
    }

    #[test]
    fn head_size_counts_lines_as_http_writes_them() {
        let mut l = HeadLimits::default();
        // 17 + ("a: b\r\n" = 6) = 23
        let head = ResponseHead::new(200, headers(1, "b")).unwrap();
        let size = 17 + "x-0".len() + 1 + 4;
        l.max_head_bytes = size;
        assert_eq!(l.check_response(&head), Ok(()));
        l.max_head_bytes = size - 1;
        assert_eq!(
            l.check_response(&head),
            Err(HeadLimitError::HeadTooLarge { limit: size - 1 })
        );
    }
}
